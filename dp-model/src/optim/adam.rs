//! Adam and AdamW (decoupled weight decay), with bias correction, as PyTorch defines them.

use dp_mem::{Pool, PoolBuf, Tag};

use std::ops::Range;

use super::codebook;
use super::quantized::{self, QuantizedBuf, STATE_BLOCK, StatePrecision};
use super::{Optimizer, check_piece, check_range, decay_runs};
use crate::error::Result;
use crate::float::Float;
use crate::ops::widest::widest;
use crate::optim::{OptimizerState, OptimizerStateMut};

/// Adam (`decoupled = false`: weight decay added to the gradient) or AdamW (`decoupled =
/// true`: parameters shrunk by `lr * weight_decay` directly).
#[derive(Debug)]
pub struct Adam<T: Float = f32> {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    moments: Moments<T>,
    len: usize,
    steps: u64,
    /// Where weight decay applies (`None`: everywhere).
    decayed: Option<Vec<Range<usize>>>,
}

/// The two moments, as the optimizer's values or quantised to 8 bits.
#[derive(Debug)]
enum Moments<T: Float> {
    F32 {
        m: PoolBuf<T>,
        v: PoolBuf<T>,
    },
    /// The first moment in the signed codebook, the second in the unsigned one.
    Int8 {
        m: QuantizedBuf,
        v: QuantizedBuf,
    },
}

/// Adam's settings, named and defaulted as PyTorch's `torch.optim.Adam`: betas (0.9, 0.999),
/// eps 1e-8, no weight decay; `decoupled` makes it AdamW.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// The moments' decay rates, each in `[0, 1)`.
    pub betas: (f64, f64),
    /// Added to the second moment's root.
    pub eps: f64,
    /// L2 penalty (added to the gradient), or with `decoupled` the weights' decay.
    pub weight_decay: f64,
    /// AdamW: decay the weights directly instead of through the gradient.
    pub decoupled: bool,
}

impl AdamConfig {
    /// Checks the settings as [`Adam::new`] does, without allocating: for a caller that
    /// validates a config before building anything.
    pub fn check(&self) -> Result<()> {
        check_range("beta1", self.betas.0, 0.0..1.0)?;
        check_range("beta2", self.betas.1, 0.0..1.0)?;
        check_range("eps", self.eps, f64::MIN_POSITIVE..f64::INFINITY)?;
        check_range("weight_decay", self.weight_decay, 0.0..f64::INFINITY)
    }
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig { betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, decoupled: false }
    }
}

impl<T: Float> Adam<T> {
    /// Adam for `len` parameters; its two moment buffers are tagged `OptState`.
    pub fn new(len: usize, config: AdamConfig, pool: &Pool) -> Result<Self> {
        Self::with_precision(len, config, StatePrecision::F32, pool)
    }

    /// Adam for `len` parameters whose moments are stored at `precision`: with
    /// [`StatePrecision::Int8`], 2 bytes per parameter plus 8 per block of [`STATE_BLOCK`]
    /// instead of `2 * size_of::<T>()`.
    pub fn with_precision(
        len: usize,
        config: AdamConfig,
        precision: StatePrecision,
        pool: &Pool,
    ) -> Result<Self> {
        config.check()?;
        let AdamConfig { betas: (beta1, beta2), eps, weight_decay, decoupled } = config;
        Ok(Self {
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            moments: match precision {
                StatePrecision::F32 => Moments::F32 {
                    m: pool.alloc_zeroed(len, Tag::OptState)?,
                    v: pool.alloc_zeroed(len, Tag::OptState)?,
                },
                StatePrecision::Int8 => Moments::Int8 {
                    m: QuantizedBuf::zeros(len, pool)?,
                    v: QuantizedBuf::zeros(len, pool)?,
                },
            },
            len,
            steps: 0,
            decayed: None,
        })
    }

    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn with_defaults(len: usize, pool: &Pool) -> Result<Self> {
        Self::new(len, AdamConfig::default(), pool)
    }

    /// Bytes of state an Adam over `len` parameters at `precision` holds: what its
    /// [`Optimizer::state_bytes`] will say, known before it is built (for memory plans).
    pub fn state_bytes_for(len: usize, precision: StatePrecision) -> u64 {
        2 * precision.buffer_bytes(len, size_of::<T>())
    }

    /// How its moments are stored.
    pub fn precision(&self) -> StatePrecision {
        match self.moments {
            Moments::F32 { .. } => StatePrecision::F32,
            Moments::Int8 { .. } => StatePrecision::Int8,
        }
    }
}

/// The numbers one Adam update applies, after its bias corrections: `g = grad + coupled_wd p`,
/// `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2) g^2`, and
/// `p = p shrink - step_size m / (sqrt(v) / sqrt_c2 + eps)`. The CPU step and the GPU kernel
/// (`kernels.cu`) take the same ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamUpdate {
    pub(crate) step_size: f64,
    pub(crate) sqrt_c2: f64,
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    pub(crate) eps: f64,
    pub(crate) coupled_wd: f64,
    pub(crate) shrink: f64,
}

impl AdamUpdate {
    /// The update of `config` at learning rate `lr` after `steps` steps, this one included.
    pub(crate) fn new(config: &AdamConfig, steps: u64, lr: f64) -> Self {
        let AdamConfig { betas: (beta1, beta2), eps, weight_decay, decoupled } = *config;
        let t = steps.max(1) as i32;
        let (correction1, correction2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
        // Folding both bias corrections into the step size and epsilon is PyTorch's form.
        AdamUpdate {
            step_size: lr / correction1,
            sqrt_c2: correction2.sqrt(),
            beta1,
            beta2,
            eps,
            coupled_wd: if decoupled { 0.0 } else { weight_decay },
            shrink: if decoupled { 1.0 - lr * weight_decay } else { 1.0 },
        }
    }
}

impl<T: Float> Adam<T> {
    /// This step's update at learning rate `lr`.
    fn update(&self, lr: f64) -> AdamUpdate {
        let config = AdamConfig {
            betas: (self.beta1, self.beta2),
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled: self.decoupled,
        };
        AdamUpdate::new(&config, self.steps, lr)
    }
}

impl<T: Float> Optimizer<T> for Adam<T> {
    fn step_part(
        &mut self,
        params: &mut [T],
        grads: &[T],
        offset: usize,
        lr: f64,
        first_piece: bool,
    ) -> Result<()> {
        check_piece("adam", self.len, offset, params.len(), grads.len())?;
        if matches!(self.moments, Moments::Int8 { .. }) {
            quantized::check_aligned("adam", self.len, offset, params.len())?;
        }
        if first_piece {
            self.steps += 1;
        }
        let s = self.update(lr);
        let decayed = self.decayed.as_deref();
        match &mut self.moments {
            Moments::F32 { m, v } => step_f32(&s, decayed, (m, v), params, grads, offset),
            Moments::Int8 { m, v } => step_int8(&s, decayed, (m, v), params, grads, offset),
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.len
    }

    fn state_bytes(&self) -> u64 {
        match &self.moments {
            Moments::F32 { m, v } => ((m.len() + v.len()) * size_of::<T>()) as u64,
            Moments::Int8 { m, v } => m.bytes() + v.bytes(),
        }
    }

    fn state(&self) -> OptimizerState<'_, T> {
        let (precision, steps) = (self.precision(), self.steps);
        let (buffers, quantized) = match &self.moments {
            Moments::F32 { m, v } => (vec![&m[..], &v[..]], vec![]),
            Moments::Int8 { m, v } => (vec![], vec![m.state(), v.state()]),
        };
        OptimizerState { kind: "adam", steps, precision, buffers, quantized }
    }

    fn decay_only(&mut self, ranges: Vec<Range<usize>>) {
        self.decayed = Some(ranges);
    }

    fn state_mut(&mut self) -> OptimizerStateMut<'_, T> {
        let precision = self.precision();
        let (buffers, quantized) = match &mut self.moments {
            Moments::F32 { m, v } => (vec![&mut m[..], &mut v[..]], vec![]),
            Moments::Int8 { m, v } => (vec![], vec![m.state_mut(), v.state_mut()]),
        };
        OptimizerStateMut { kind: "adam", steps: &mut self.steps, precision, buffers, quantized }
    }
}

/// One update of `params` (at `offset` of the range) with unquantised moments.
fn step_f32<T: Float>(
    s: &AdamUpdate,
    decayed: Option<&[Range<usize>]>,
    (m, v): (&mut [T], &mut [T]),
    params: &mut [T],
    grads: &[T],
    offset: usize,
) {
    let (step_size, sqrt_c2) = (T::of(s.step_size), T::of(s.sqrt_c2));
    let (b1, b2, eps) = (T::of(s.beta1), T::of(s.beta2), T::of(s.eps));
    let (one_b1, one_b2) = (T::one() - b1, T::one() - b2);
    for (run, decays) in decay_runs(decayed, offset, params.len()) {
        let (coupled_wd, shrink) =
            if decays { (T::of(s.coupled_wd), T::of(s.shrink)) } else { (T::zero(), T::one()) };
        let (params, grads) = (&mut params[run.clone()], &grads[run.clone()]);
        let moments = offset + run.start..offset + run.end;
        let (m, v) = (&mut m[moments.clone()], &mut v[moments]);
        widest(
            #[inline(always)]
            || {
                for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                    let g = g + coupled_wd * *p;
                    *m = b1 * *m + one_b1 * g;
                    *v = b2 * *v + one_b2 * g * g;
                    *p = *p * shrink - step_size * *m / (v.sqrt() / sqrt_c2 + eps);
                }
            },
        );
    }
}

/// One update of `params` (at `offset` of the range, a whole number of blocks) with 8-bit
/// moments: block by block, the moments are dequantised into two block-sized buffers on the
/// stack, updated there exactly as [`step_f32`] does (the parameters see the new moments
/// before they are rounded), and requantised.
fn step_int8<T: Float>(
    s: &AdamUpdate,
    decayed: Option<&[Range<usize>]>,
    moments: (&mut QuantizedBuf, &mut QuantizedBuf),
    params: &mut [T],
    grads: &[T],
    offset: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if super::quantized_avx2::available() {
        // SAFETY: the CPU has AVX2.
        return unsafe { step_int8_avx2(s, decayed, moments, params, grads, offset) };
    }
    step_int8_blocks(s, decayed, moments, params, grads, offset)
}

/// [`step_int8_blocks`] compiled for AVX2: its update runs eight lanes wide instead of four
/// (the same operations, so the same results), which with the AVX2 quantisation halves what
/// 8-bit state adds to a step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn step_int8_avx2<T: Float>(
    s: &AdamUpdate,
    decayed: Option<&[Range<usize>]>,
    moments: (&mut QuantizedBuf, &mut QuantizedBuf),
    params: &mut [T],
    grads: &[T],
    offset: usize,
) {
    step_int8_blocks(s, decayed, moments, params, grads, offset)
}

#[inline(always)]
fn step_int8_blocks<T: Float>(
    s: &AdamUpdate,
    decayed: Option<&[Range<usize>]>,
    (m, v): (&mut QuantizedBuf, &mut QuantizedBuf),
    params: &mut [T],
    grads: &[T],
    offset: usize,
) {
    let (step_size, sqrt_c2) = (T::of(s.step_size), T::of(s.sqrt_c2));
    let (b1, b2, eps) = (T::of(s.beta1), T::of(s.beta2), T::of(s.eps));
    let (one_b1, one_b2) = (T::one() - b1, T::one() - b2);
    let (signed, unsigned) = (&*codebook::SIGNED, &*codebook::UNSIGNED);
    let (mut m_block, mut v_block) = ([0f32; STATE_BLOCK], [0f32; STATE_BLOCK]);
    for (i, (params, grads)) in
        params.chunks_mut(STATE_BLOCK).zip(grads.chunks(STATE_BLOCK)).enumerate()
    {
        let start = offset + i * STATE_BLOCK;
        let block = start / STATE_BLOCK;
        let n = params.len();
        let ((m_codes, m_scale), (v_codes, v_scale)) = (m.block_mut(block), v.block_mut(block));
        let (m_vals, v_vals) = (&mut m_block[..n], &mut v_block[..n]);
        quantized::dequantize(signed, m_codes, *m_scale, m_vals);
        quantized::dequantize(unsigned, v_codes, *v_scale, v_vals);
        for (run, decays) in decay_runs(decayed, start, n) {
            let (coupled_wd, shrink) =
                if decays { (T::of(s.coupled_wd), T::of(s.shrink)) } else { (T::zero(), T::one()) };
            let (params, grads) = (&mut params[run.clone()], &grads[run.clone()]);
            let (m_vals, v_vals) = (&mut m_vals[run.clone()], &mut v_vals[run]);
            for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m_vals).zip(v_vals) {
                let g = g + coupled_wd * *p;
                let m_new = b1 * T::of(f64::from(*m)) + one_b1 * g;
                let v_new = b2 * T::of(f64::from(*v)) + one_b2 * g * g;
                *p = *p * shrink - step_size * m_new / (v_new.sqrt() / sqrt_c2 + eps);
                (*m, *v) = (m_new.f64() as f32, v_new.f64() as f32);
            }
        }
        *m_scale = quantized::quantize(signed, m_vals, m_codes);
        *v_scale = quantized::quantize(unsigned, v_vals, v_codes);
    }
}
