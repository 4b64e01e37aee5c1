//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay, with
//! PyTorch's update rule so hyperparameters carry over.

use dp_mem::{Pool, PoolBuf, Tag};

use std::ops::Range;

use super::codebook;
use super::quantized::{self, QuantizedBuf, STATE_BLOCK, StatePrecision};
use super::{Optimizer, check_piece, check_range, decay_runs};
use crate::error::Result;
use crate::float::Float;
use crate::optim::{OptimizerState, OptimizerStateMut};

/// SGD: `g = grad + wd * p; v = momentum * v + g; p -= lr * (nesterov ? g + momentum * v : v)`.
#[derive(Debug)]
pub struct Sgd<T: Float = f32> {
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    /// Velocity; empty without momentum.
    velocity: PoolBuf<T>,
    /// With 8-bit state and momentum, the velocity instead (and `velocity` empty).
    quantized: Option<QuantizedBuf>,
    precision: StatePrecision,
    len: usize,
    steps: u64,
    /// Where weight decay applies (`None`: everywhere).
    decayed: Option<Vec<Range<usize>>>,
}

/// SGD's settings, named and defaulted as PyTorch's `torch.optim.SGD`: no momentum, no
/// Nesterov, no weight decay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SgdConfig {
    /// Momentum, in `[0, 1)`; 0 keeps no velocity.
    pub momentum: f64,
    /// Nesterov momentum (needs `momentum > 0`).
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
}

impl SgdConfig {
    /// Checks the settings as [`Sgd::new`] does, without allocating: for a caller that
    /// validates a config before building anything.
    pub fn check(&self) -> Result<()> {
        check_range("momentum", self.momentum, 0.0..1.0)?;
        check_range("weight_decay", self.weight_decay, 0.0..f64::INFINITY)?;
        if self.nesterov && self.momentum == 0.0 {
            return Err(crate::Error::Optimizer {
                field: "nesterov",
                what: "needs momentum > 0".into(),
            });
        }
        Ok(())
    }
}

impl<T: Float> Sgd<T> {
    /// SGD for `len` parameters. The velocity buffer (tag `OptState`) exists only with
    /// momentum.
    pub fn new(len: usize, config: SgdConfig, pool: &Pool) -> Result<Self> {
        Self::with_precision(len, config, StatePrecision::F32, pool)
    }

    /// SGD for `len` parameters whose velocity (with momentum) is stored at `precision`:
    /// with [`StatePrecision::Int8`], 1 byte per parameter plus 4 per block of
    /// [`STATE_BLOCK`].
    pub fn with_precision(
        len: usize,
        config: SgdConfig,
        precision: StatePrecision,
        pool: &Pool,
    ) -> Result<Self> {
        config.check()?;
        let SgdConfig { momentum, nesterov, weight_decay } = config;
        let state_len = if momentum > 0.0 && precision == StatePrecision::F32 { len } else { 0 };
        let quantized = (momentum > 0.0 && precision == StatePrecision::Int8)
            .then(|| QuantizedBuf::zeros(len, pool))
            .transpose()?;
        Ok(Self {
            momentum,
            nesterov,
            weight_decay,
            velocity: pool.alloc_zeroed(state_len, Tag::OptState)?,
            quantized,
            precision,
            len,
            steps: 0,
            decayed: None,
        })
    }

    /// Bytes of state an SGD over `len` parameters, with or without `momentum`, at
    /// `precision` holds: what its [`Optimizer::state_bytes`] will say, known before it is
    /// built (for memory plans).
    pub fn state_bytes_for(len: usize, momentum: bool, precision: StatePrecision) -> u64 {
        if momentum { precision.buffer_bytes(len, size_of::<T>()) } else { 0 }
    }
}

impl<T: Float> Optimizer<T> for Sgd<T> {
    fn step_part(
        &mut self,
        params: &mut [T],
        grads: &[T],
        offset: usize,
        lr: f64,
        first_piece: bool,
    ) -> Result<()> {
        check_piece("sgd", self.len, offset, params.len(), grads.len())?;
        if self.precision == StatePrecision::Int8 && self.momentum > 0.0 {
            quantized::check_aligned("sgd", self.len, offset, params.len())?;
        }
        if let Some(velocity) = &mut self.quantized {
            let (decayed, wd) = (self.decayed.as_deref(), self.weight_decay);
            let (mu, nesterov) = (self.momentum, self.nesterov);
            step_int8(velocity, decayed, (lr, mu, wd, nesterov), params, grads, offset);
            if first_piece {
                self.steps += 1;
            }
            return Ok(());
        }
        let (lr, mu) = (T::of(lr), T::of(self.momentum));
        for (run, decays) in decay_runs(self.decayed.as_deref(), offset, params.len()) {
            let wd = if decays { T::of(self.weight_decay) } else { T::zero() };
            let (params, grads) = (&mut params[run.clone()], &grads[run.clone()]);
            if self.velocity.is_empty() {
                for (p, &g) in params.iter_mut().zip(grads) {
                    *p -= lr * (g + wd * *p);
                }
                continue;
            }
            let velocity = &mut self.velocity[offset + run.start..offset + run.end];
            for ((p, &g), v) in params.iter_mut().zip(grads).zip(velocity) {
                let g = g + wd * *p;
                *v = mu * *v + g;
                *p -= lr * if self.nesterov { g + mu * *v } else { *v };
            }
        }
        if first_piece {
            self.steps += 1;
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.len
    }

    fn state_bytes(&self) -> u64 {
        (self.velocity.len() * size_of::<T>()) as u64
            + self.quantized.as_ref().map_or(0, |q| q.bytes())
    }

    // With momentum there is one buffer, also over an empty range (a replica's empty shard),
    // so that every shard of one optimizer has the same buffers.
    fn state(&self) -> OptimizerState<'_, T> {
        let (precision, steps) = (self.precision, self.steps);
        let (buffers, quantized) = match &self.quantized {
            _ if self.momentum == 0.0 => (vec![], vec![]),
            Some(q) => (vec![], vec![q.state()]),
            None => (vec![&self.velocity[..]], vec![]),
        };
        OptimizerState { kind: "sgd", steps, precision, buffers, quantized }
    }

    fn decay_only(&mut self, ranges: Vec<Range<usize>>) {
        self.decayed = Some(ranges);
    }

    fn state_mut(&mut self) -> OptimizerStateMut<'_, T> {
        let precision = self.precision;
        let (buffers, quantized) = match &mut self.quantized {
            _ if self.momentum == 0.0 => (vec![], vec![]),
            Some(q) => (vec![], vec![q.state_mut()]),
            None => (vec![&mut self.velocity[..]], vec![]),
        };
        OptimizerStateMut { kind: "sgd", steps: &mut self.steps, precision, buffers, quantized }
    }
}

/// One update of `params` (at `offset` of the range, a whole number of blocks) with an 8-bit
/// velocity: block by block, dequantised into a block-sized buffer on the stack, updated
/// there as the unquantised step does, and requantised.
fn step_int8<T: Float>(
    velocity: &mut QuantizedBuf,
    decayed: Option<&[Range<usize>]>,
    (lr, mu, weight_decay, nesterov): (f64, f64, f64, bool),
    params: &mut [T],
    grads: &[T],
    offset: usize,
) {
    let (lr, mu) = (T::of(lr), T::of(mu));
    let book = &*codebook::SIGNED;
    let mut block_vals = [0f32; STATE_BLOCK];
    for (i, (params, grads)) in
        params.chunks_mut(STATE_BLOCK).zip(grads.chunks(STATE_BLOCK)).enumerate()
    {
        let start = offset + i * STATE_BLOCK;
        let (codes, scale) = velocity.block_mut(start / STATE_BLOCK);
        let vals = &mut block_vals[..params.len()];
        quantized::dequantize(book, codes, *scale, vals);
        for (run, decays) in decay_runs(decayed, start, params.len()) {
            let wd = if decays { T::of(weight_decay) } else { T::zero() };
            let (params, grads) = (&mut params[run.clone()], &grads[run.clone()]);
            for ((p, &g), v) in params.iter_mut().zip(grads).zip(&mut vals[run]) {
                let g = g + wd * *p;
                let v_new = mu * T::of(f64::from(*v)) + g;
                *p -= lr * if nesterov { g + mu * v_new } else { v_new };
                *v = v_new.f64() as f32;
            }
        }
        *scale = quantized::quantize(book, vals, codes);
    }
}
