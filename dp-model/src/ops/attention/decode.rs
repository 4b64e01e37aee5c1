//! Attention for one new position against the cached keys and values (generation with a KV
//! cache).

use super::CausalAttention;
use super::softmax::{dot_of, exp_row, rescale, row_max_of};
use super::tiles::{BLOCK, madd};
use crate::float::Float;

impl CausalAttention {
    /// Decoding with fused multiply-adds (`F`) or without: per head, the same streaming
    /// softmax as forward over blocks of cached keys, one query row.
    #[inline(always)]
    pub(super) fn decode_in<const F: bool, T: Float>(
        &self,
        q: &[T],
        k_cache: &[T],
        v_cache: &[T],
        len: usize,
        y: &mut [T],
        scratch: &mut [T],
    ) {
        let (hd, d) = (self.head_dim, self.d());
        debug_assert!(q.len() >= d && y.len() >= d && scratch.len() >= self.scratch_len());
        debug_assert!(k_cache.len() >= len * d && v_cache.len() >= len * d);
        let scale = self.scale::<T>();
        let s = &mut scratch[..BLOCK];
        for h in 0..self.heads {
            let q_h = &q[h * hd..(h + 1) * hd];
            let y_h = &mut y[h * hd..(h + 1) * hd];
            y_h.fill(T::zero());
            let (mut max, mut sum) = (T::neg_infinity(), T::zero());
            for j0 in (0..len).step_by(BLOCK) {
                let nk = BLOCK.min(len - j0);
                for (c, score) in s[..nk].iter_mut().enumerate() {
                    let key = &k_cache[(j0 + c) * d + h * hd..][..hd];
                    *score = dot_of::<F, T>(q_h, key);
                }
                let new = max.max(scale * row_max_of(&s[..nk]));
                let block_sum = exp_row::<F, T>(&mut s[..nk], nk, scale, new);
                let alpha = rescale(max, new);
                sum = alpha * sum + block_sum;
                max = new;
                if alpha != T::one() {
                    for o in y_h.iter_mut() {
                        *o *= alpha;
                    }
                }
                for (c, &weight) in s[..nk].iter().enumerate() {
                    let value = &v_cache[(j0 + c) * d + h * hd..][..hd];
                    for (o, &x) in y_h.iter_mut().zip(value) {
                        *o = madd::<F, T>(weight, x, *o);
                    }
                }
            }
            if sum > T::zero() {
                let inv = T::one() / sum;
                for o in y_h.iter_mut() {
                    *o *= inv;
                }
            }
        }
    }
}
