//! Batch norm on the GPU with the CPU's statistics (src/ops/batch_norm.rs and the kernels of
//! batch_norm.cu): training normalizes by the batch's mean and variance, summed in two passes
//! (partial sums per channel in f32, their totals in f64), saves them for backward and moves
//! the running statistics, which live in the CPU's layout so checkpoints and evaluation read
//! them unchanged; evaluation normalizes by the running statistics. Synchronized (`--sync-bn`),
//! the f64 sums are summed over the replicas between the two halves, as on the CPU.

use super::backward::InputGrad;
use super::{Device, GpuModel, ptr};
use crate::cuda::device_memory::norm_parts;
use crate::error::Result;
use crate::ops::batch_norm::{BatchNorm, NormPass};

/// Where one batch norm's values are, as its kernels take them.
struct Places {
    channels: i64,
    /// Values per channel in the batch.
    count: i64,
    /// How far apart channels and a channel's values are.
    cs: i64,
    es: i64,
    parts: i64,
    gamma: u64,
    beta: u64,
    mean: u64,
    inv_std: u64,
    running_mean: u64,
    running_var: u64,
    partials: u64,
    sums: u64,
    consts: u64,
}

impl<D: Device> GpuModel<D> {
    fn places(&self, b: &BatchNorm, batch: usize) -> Places {
        let count = batch * b.plane;
        let (channels, c) = (b.channels as i64, 4 * b.channels as u64);
        let (cs, es) = if b.channel_major { (count as i64, 1) } else { (1, channels) };
        let gamma = ptr(&self.params) + 4 * b.offset as u64;
        let mean = ptr(&self.norm_stats) + 4 * b.stats_offset as u64;
        let running_mean = ptr(&self.norm_buffers) + 4 * b.buffer_offset as u64;
        Places {
            channels,
            count: count as i64,
            cs,
            es,
            parts: norm_parts(count) as i64,
            gamma,
            beta: gamma + c,
            mean,
            inv_std: mean + c,
            running_mean,
            running_var: running_mean + c,
            partials: ptr(&self.work.norm_partials),
            sums: ptr(&self.work.norm_sums),
            consts: ptr(&self.work.norm_consts),
        }
    }

    pub(super) fn norm_forward(
        &self,
        b: &BatchNorm,
        batch: usize,
        x: u64,
        y: u64,
        pass: NormPass,
    ) -> Result<()> {
        let Places {
            channels,
            count,
            cs,
            es,
            parts,
            gamma,
            beta,
            mean,
            inv_std,
            running_mean,
            running_var,
            partials,
            sums,
            consts,
        } = self.places(b, batch);
        let c = b.channels;
        let (momentum, eps) = (b.momentum, b.eps);
        match pass {
            NormPass::Train => {
                let (no_dy, no_mean) = (0u64, 0u64);
                launch!(self, "dp_bn_partials", c * parts as usize; x, no_dy, no_mean, partials, channels, count, cs, es, parts);
                let total = count as f64;
                launch!(self, "dp_bn_moments", c; partials, x, sums, channels, parts, cs, total);
                self.sum_across(sums, 2 * c + 1);
                launch!(self, "dp_bn_record", c; sums, mean, inv_std, running_mean, running_var, channels, momentum, eps);
            }
            NormPass::Eval => {
                launch!(self, "dp_bn_running", c; running_mean, running_var, mean, inv_std, channels, eps);
            }
            // Normalizes again by the statistics saved in training.
            NormPass::Recompute => {}
        }
        launch!(self, "dp_bn_affine", c; gamma, beta, mean, inv_std, consts, channels);
        launch!(self, "dp_bn_apply", c * count as usize; x, y, consts, channels, count, cs);
        Ok(())
    }

    /// The scale and shift gradients (written, or added with `accumulate`) and the input's
    /// gradient where `dx` asks for it.
    pub(super) fn norm_backward(
        &self,
        b: &BatchNorm,
        batch: usize,
        x: u64,
        dy: u64,
        dx: InputGrad,
        accumulate: bool,
    ) -> Result<()> {
        let Places {
            channels,
            count,
            cs,
            es,
            parts,
            gamma,
            mean,
            inv_std,
            partials,
            sums,
            consts,
            ..
        } = self.places(b, batch);
        let c = b.channels;
        let dgamma = ptr(&self.grads) + 4 * b.offset as u64;
        let dbeta = dgamma + 4 * c as u64;
        launch!(self, "dp_bn_partials", c * parts as usize; x, dy, mean, partials, channels, count, cs, es, parts);
        let (total, accumulate) = (count as f64, i32::from(accumulate));
        launch!(self, "dp_bn_grad_sums", c; partials, inv_std, dgamma, dbeta, sums, channels, parts, total, accumulate);
        let Some((dx, add)) = dx else { return Ok(()) };
        let add = i32::from(add);
        // Synchronized, the input gradient needs the sums over every replica's samples (the
        // parameter gradients above stay local: the gradient all-reduce sums them).
        self.sum_across(sums, 2 * c + 1);
        launch!(self, "dp_bn_grad_consts", c; sums, gamma, inv_std, consts, channels);
        launch!(self, "dp_bn_input_grad", c * count as usize; x, dy, dx, mean, consts, channels, count, cs, add);
        Ok(())
    }
}
