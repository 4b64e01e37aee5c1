//! 8-bit optimizer state on the GPU (`optimizer_bits = 8`): the CPU's blockwise quantised
//! state (`optim/quantized.rs`), codes and scales in device memory in the CPU's layout (so a
//! checkpoint moves between the two unchanged), updated by `optim8.cu` as the CPU's 8-bit
//! Adam and SGD update it.

use dp_mem::Tag;

use super::{Device, DeviceBuf, GpuModel, ptr};
use crate::cuda::device_memory::{INT8_LANES, int8_work_len};
use crate::error::{Error, Result};
use crate::optim::{
    AdamConfig, AdamUpdate, QuantizedState, QuantizedStateMut, STATE_BLOCK, SgdConfig,
    StateCodebook,
};

/// One 8-bit state buffer on the device: a code per value, a scale per block of
/// [`STATE_BLOCK`], and the update's work area (the codebook's table, the blocks' old scales
/// and each block's lane maxima).
pub struct QuantizedDeviceBuf<D: Device> {
    codes: DeviceBuf<u8, D>,
    scales: DeviceBuf<f32, D>,
    work: DeviceBuf<f32, D>,
}

impl<D: Device> GpuModel<D> {
    /// A zeroed 8-bit state buffer as long as the updated parameters, in `book` (tag
    /// `OptState`).
    pub fn quantized_state(&self, book: StateCodebook) -> Result<QuantizedDeviceBuf<D>> {
        let (len, blocks) = (self.update.len(), self.update.len().div_ceil(STATE_BLOCK));
        let buf = QuantizedDeviceBuf {
            codes: self.pool.alloc::<u8>(len.max(1), Tag::OptState)?,
            scales: self.pool.alloc::<f32>(blocks.max(1), Tag::OptState)?,
            work: self.pool.alloc::<f32>(int8_work_len(blocks), Tag::OptState)?,
        };
        // SAFETY: live device buffers of these sizes; the device orders it before use.
        unsafe {
            self.device.zero(ptr(&buf.codes), buf.codes.len())?;
            self.device.zero(ptr(&buf.scales), 4 * buf.scales.len())?;
        }
        self.copy_in(ptr(&buf.work), &book.codebook().device_table())?;
        self.synchronize()?;
        Ok(buf)
    }

    /// One Adam (or AdamW) step with 8-bit moments `m` (signed) and `v` (unsigned), as
    /// [`Adam`](crate::Adam) with [`StatePrecision::Int8`](crate::StatePrecision) after `steps`
    /// steps including this one.
    pub fn adam8_step(
        &mut self,
        (m, v): (&mut QuantizedDeviceBuf<D>, &mut QuantizedDeviceBuf<D>),
        steps: u64,
        lr: f64,
        config: &AdamConfig,
    ) -> Result<()> {
        let s = AdamUpdate::new(config, steps, lr);
        let (p, g, n) = self.update_args();
        let (mc, ms, mw) = (ptr(&m.codes), ptr(&m.scales), ptr(&m.work));
        let (vc, vs, vw) = (ptr(&v.codes), ptr(&v.scales), ptr(&v.work));
        let (step_size, sqrt_c2) = (s.step_size as f32, s.sqrt_c2 as f32);
        let (b1, b2, eps) = (s.beta1 as f32, s.beta2 as f32, s.eps as f32);
        let (coupled_wd, shrink) = (s.coupled_wd as f32, s.shrink as f32);
        let (decayed, ranges) = self.decay_args();
        let threads = self.update.len().div_ceil(STATE_BLOCK) * INT8_LANES;
        launch!(self, "dp_adam8_maxima", threads; p, g, n, mc, ms, mw, vc, vs, vw, b1, b2, coupled_wd, decayed, ranges);
        launch!(self, "dp_adam8_step", threads; p, g, n, mc, ms, mw, vc, vs, vw, step_size, sqrt_c2, b1, b2, eps, coupled_wd, shrink, decayed, ranges);
        Ok(())
    }

    /// One SGD step with momentum and an 8-bit `velocity`, as [`Sgd`](crate::Sgd) with
    /// [`StatePrecision::Int8`](crate::StatePrecision).
    pub fn sgd8_step(
        &mut self,
        velocity: &mut QuantizedDeviceBuf<D>,
        lr: f64,
        config: &SgdConfig,
    ) -> Result<()> {
        let (p, g, n) = self.update_args();
        let (codes, scales, work) =
            (ptr(&velocity.codes), ptr(&velocity.scales), ptr(&velocity.work));
        let (lr, wd, mu) = (lr as f32, config.weight_decay as f32, config.momentum as f32);
        let nesterov = i32::from(config.nesterov);
        let (decayed, ranges) = self.decay_args();
        let threads = self.update.len().div_ceil(STATE_BLOCK) * INT8_LANES;
        launch!(self, "dp_sgd8_maxima", threads; p, g, n, codes, scales, work, wd, mu, decayed, ranges);
        launch!(self, "dp_sgd8_step", threads; p, g, n, codes, scales, work, lr, wd, mu, nesterov, decayed, ranges);
        Ok(())
    }

    /// Copies `src` (8-bit state restored from a checkpoint) into `dst`.
    pub fn upload_quantized(
        &self,
        dst: &mut QuantizedDeviceBuf<D>,
        src: QuantizedState<'_>,
    ) -> Result<()> {
        check_lens(dst, src.codes.len(), src.scales.len(), self.update.len())?;
        self.copy_in(ptr(&dst.codes), src.codes)?;
        self.copy_in(ptr(&dst.scales), src.scales)?;
        self.synchronize()
    }

    /// Copies `src` into `dst` (8-bit state for a checkpoint).
    pub fn download_quantized(
        &self,
        src: &QuantizedDeviceBuf<D>,
        dst: QuantizedStateMut<'_>,
    ) -> Result<()> {
        check_lens(src, dst.codes.len(), dst.scales.len(), self.update.len())?;
        self.copy_out(dst.codes, ptr(&src.codes))?;
        self.copy_out(dst.scales, ptr(&src.scales))
    }
}

/// Refuses host state of another length than the device buffer's `len` values.
fn check_lens<D: Device>(
    buf: &QuantizedDeviceBuf<D>,
    codes: usize,
    scales: usize,
    len: usize,
) -> Result<()> {
    let blocks = len.div_ceil(STATE_BLOCK);
    if codes != len || scales != blocks || buf.scales.len() != blocks.max(1) {
        return Err(Error::shape(
            "8-bit optimizer state",
            format!("{len} codes and {blocks} scales"),
            format!("{codes} codes and {scales} scales"),
        ));
    }
    Ok(())
}
