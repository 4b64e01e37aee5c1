//! Attention's forward: the streaming softmax over blocks of keys, block pair by block pair.

use super::CausalAttention;
use super::operands::Left;
use super::softmax::{exp_row, rescale, row_max_of};
use super::tiles::{BLOCK, NR, Visible, pack_transposed, product};
use crate::float::Float;

impl CausalAttention {
    /// Forward with fused multiply-adds (`F`) or without. Inlined into its callers so that
    /// [`CausalAttention::forward_fma`]'s features reach every loop.
    #[inline(always)]
    pub(super) fn forward_in<const F: bool, const WIDE: bool, T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &mut [T],
        lse: &mut [T],
        scratch: &mut [T],
    ) {
        let (t, heads, hd, d) = (self.t, self.heads, self.head_dim, self.d());
        let ld = 3 * d;
        debug_assert!(qkv.len() >= batch * t * ld && y.len() >= batch * t * d);
        debug_assert!(lse.len() >= batch * self.stats_len());
        debug_assert!(scratch.len() >= self.scratch_len());
        let scale = self.scale::<T>();
        let (kt, rest) = scratch.split_at_mut(hd * BLOCK);
        let (s, rest) = rest.split_at_mut(BLOCK * BLOCK);
        let (row_max, rest) = rest.split_at_mut(t);
        let row_sum = &mut rest[..t];
        for b in 0..batch {
            let qkv_b = &qkv[b * t * ld..(b + 1) * t * ld];
            let y_b = &mut y[b * t * d..(b + 1) * t * d];
            for h in 0..heads {
                let q = &qkv_b[h * hd..];
                let k = &qkv_b[d + h * hd..];
                let v = &qkv_b[2 * d + h * hd..];
                // The output rows accumulate in place in `y`, rescaled whenever a row's
                // running maximum grows, and are divided by their sums at the end.
                let out = &mut y_b[h * hd..];
                row_max.fill(T::neg_infinity());
                row_sum.fill(T::zero());
                // Key blocks outermost, so that each is packed once per head; every query
                // row still meets its key blocks in order, as the running maximum needs.
                for j0 in (0..t).step_by(BLOCK) {
                    let nk = BLOCK.min(t - j0);
                    let padded = nk.div_ceil(NR) * NR;
                    pack_transposed(&k[j0 * ld..], ld, nk, hd, kt, padded);
                    for i0 in (j0..t).step_by(BLOCK) {
                        let nq = BLOCK.min(t - i0);
                        // Query row `r` of the block sees key `c` of the block iff
                        // `c <= r + shift`.
                        let shift = i0 - j0;
                        let q_rows = Left { data: &q[i0 * ld..], row: ld, col: 1 };
                        product::<F, WIDE, T>(
                            (nq, hd, padded),
                            q_rows,
                            (kt, BLOCK),
                            (&mut *s, BLOCK),
                            false,
                            Visible::Columns(shift),
                        );
                        for r in 0..nq {
                            let seen = nk.min(r + shift + 1);
                            let row = &mut s[r * BLOCK..r * BLOCK + nk];
                            let old = row_max[i0 + r];
                            let new = old.max(scale * row_max_of(&row[..seen]));
                            let sum = exp_row::<F, T>(row, seen, scale, new);
                            let alpha = rescale(old, new);
                            row_sum[i0 + r] = alpha * row_sum[i0 + r] + sum;
                            row_max[i0 + r] = new;
                            if j0 > 0 && alpha != T::one() {
                                let at = (i0 + r) * d;
                                for o in &mut out[at..at + hd] {
                                    *o *= alpha;
                                }
                            }
                        }
                        product::<F, WIDE, T>(
                            (nq, nk, hd),
                            Left { data: &*s, row: BLOCK, col: 1 },
                            (&v[j0 * ld..], ld),
                            (&mut out[i0 * d..], d),
                            j0 > 0,
                            Visible::SumUpTo(shift),
                        );
                    }
                }
                let lse_h = &mut lse[(b * heads + h) * t..(b * heads + h + 1) * t];
                for (i, ((lse, &max), &sum)) in
                    lse_h.iter_mut().zip(&*row_max).zip(&*row_sum).enumerate()
                {
                    let inv = T::one() / sum;
                    for o in &mut out[i * d..i * d + hd] {
                        *o *= inv;
                    }
                    *lse = max + sum.ln();
                }
            }
        }
    }
}
