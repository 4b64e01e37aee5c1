//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay, with
//! PyTorch's update rule so hyperparameters carry over.

use dp_mem::{Pool, PoolBuf, Tag};

use std::ops::Range;

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

impl<T: Float> Sgd<T> {
    /// SGD for `len` parameters. The velocity buffer (tag `OptState`) exists only with
    /// momentum.
    pub fn new(len: usize, config: SgdConfig, pool: &Pool) -> Result<Self> {
        let SgdConfig { momentum, nesterov, weight_decay } = config;
        check_range("momentum", momentum, 0.0..1.0)?;
        check_range("weight_decay", weight_decay, 0.0..f64::INFINITY)?;
        if nesterov && momentum == 0.0 {
            return Err(crate::Error::Optimizer {
                field: "nesterov",
                what: "needs momentum > 0".into(),
            });
        }
        let state_len = if momentum > 0.0 { len } else { 0 };
        Ok(Self {
            momentum,
            nesterov,
            weight_decay,
            velocity: pool.alloc_zeroed(state_len, Tag::OptState)?,
            len,
            steps: 0,
            decayed: None,
        })
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
    }

    // With momentum there is one buffer, also over an empty range (a replica's empty shard),
    // so that every shard of one optimizer has the same buffers.
    fn state(&self) -> OptimizerState<'_, T> {
        let buffers = if self.momentum == 0.0 { vec![] } else { vec![&self.velocity[..]] };
        OptimizerState { kind: "sgd", steps: self.steps, buffers }
    }

    fn decay_only(&mut self, ranges: Vec<Range<usize>>) {
        self.decayed = Some(ranges);
    }

    fn state_mut(&mut self) -> OptimizerStateMut<'_, T> {
        let buffers = if self.momentum == 0.0 { vec![] } else { vec![&mut self.velocity[..]] };
        OptimizerStateMut { kind: "sgd", steps: &mut self.steps, buffers }
    }
}
