//! Attention's backward: each block's probabilities recomputed from forward's log-sum-exp,
//! then the gradients of the queries, keys and values.

use super::CausalAttention;
use super::operands::Left;
use super::softmax::{dot_of, exp_row};
use super::tiles::{BLOCK, NR, Visible, pack_transposed, product};
use crate::float::Float;

impl CausalAttention {
    /// Backward (FlashAttention-2's) with fused multiply-adds (`F`) or without. Per head:
    /// `D_i = rowsum(dO_i * O_i)`; then per key block, per query block on or below it,
    /// `P = exp(s - lse)` recomputed, `dV += P^T dO`, `dP = dO V^T`, `dS = P * (dP - D)`,
    /// `dQ += dS K * scale`, `dK += dS^T Q * scale`, all accumulated in place in `dqkv`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward_in<const F: bool, const WIDE: bool, T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &[T],
        dy: &[T],
        lse: &[T],
        dqkv: &mut [T],
        scratch: &mut [T],
    ) {
        let (t, heads, hd, d) = (self.t, self.heads, self.head_dim, self.d());
        let ld = 3 * d;
        debug_assert!(qkv.len() >= batch * t * ld && dqkv.len() >= batch * t * ld);
        debug_assert!(y.len() >= batch * t * d && dy.len() >= batch * t * d);
        debug_assert!(lse.len() >= batch * self.stats_len());
        debug_assert!(scratch.len() >= self.scratch_len());
        let scale = self.scale::<T>();
        let (kt, rest) = scratch.split_at_mut(hd * BLOCK);
        let (vt, rest) = rest.split_at_mut(hd * BLOCK);
        let (p, rest) = rest.split_at_mut(BLOCK * BLOCK);
        let (ds, rest) = rest.split_at_mut(BLOCK * BLOCK);
        let row_dot = &mut rest[..t];
        dqkv[..batch * t * ld].fill(T::zero());
        for b in 0..batch {
            let qkv_b = &qkv[b * t * ld..(b + 1) * t * ld];
            let dqkv_b = &mut dqkv[b * t * ld..(b + 1) * t * ld];
            for h in 0..heads {
                let q = &qkv_b[h * hd..];
                let k = &qkv_b[d + h * hd..];
                let v = &qkv_b[2 * d + h * hd..];
                let o = &y[b * t * d + h * hd..];
                let d_o = &dy[b * t * d + h * hd..];
                let lse_h = &lse[(b * heads + h) * t..(b * heads + h + 1) * t];
                for (i, dot) in row_dot.iter_mut().enumerate() {
                    *dot = dot_of::<F, T>(&d_o[i * d..i * d + hd], &o[i * d..i * d + hd]);
                }
                // Offsets in `dqkv_b` of the head's query, key and value gradients.
                let (dq, dk, dv) = (h * hd, d + h * hd, 2 * d + h * hd);
                for j0 in (0..t).step_by(BLOCK) {
                    let nk = BLOCK.min(t - j0);
                    let padded = nk.div_ceil(NR) * NR;
                    pack_transposed(&k[j0 * ld..], ld, nk, hd, kt, padded);
                    pack_transposed(&v[j0 * ld..], ld, nk, hd, vt, padded);
                    for i0 in (j0..t).step_by(BLOCK) {
                        let nq = BLOCK.min(t - i0);
                        let shift = i0 - j0;
                        let q_rows = Left { data: &q[i0 * ld..], row: ld, col: 1 };
                        let do_rows = Left { data: &d_o[i0 * d..], row: d, col: 1 };
                        product::<F, WIDE, T>(
                            (nq, hd, padded),
                            q_rows,
                            (kt, BLOCK),
                            (&mut *p, BLOCK),
                            false,
                            Visible::Columns(shift),
                        );
                        for r in 0..nq {
                            let seen = nk.min(r + shift + 1);
                            let row = &mut p[r * BLOCK..r * BLOCK + nk];
                            exp_row::<F, T>(row, seen, scale, lse_h[i0 + r]);
                        }
                        product::<F, WIDE, T>(
                            (nk, nq, hd),
                            Left { data: &*p, row: 1, col: BLOCK },
                            (&d_o[i0 * d..], d),
                            (&mut dqkv_b[dv + j0 * ld..], ld),
                            true,
                            Visible::SumFrom(shift),
                        );
                        product::<F, WIDE, T>(
                            (nq, hd, padded),
                            do_rows,
                            (vt, BLOCK),
                            (&mut *ds, BLOCK),
                            false,
                            Visible::Columns(shift),
                        );
                        for r in 0..nq {
                            let seen = nk.min(r + shift + 1);
                            let dot = row_dot[i0 + r];
                            let p_row = &p[r * BLOCK..r * BLOCK + seen];
                            let ds_row = &mut ds[r * BLOCK..r * BLOCK + nk];
                            // The softmax scale, folded in here once, reaches both `dQ`
                            // and `dK`.
                            for (g, &pr) in ds_row.iter_mut().zip(p_row) {
                                *g = pr * (*g - dot) * scale;
                            }
                            ds_row[seen..].fill(T::zero());
                        }
                        product::<F, WIDE, T>(
                            (nq, nk, hd),
                            Left { data: &*ds, row: BLOCK, col: 1 },
                            (&k[j0 * ld..], ld),
                            (&mut dqkv_b[dq + i0 * ld..], ld),
                            true,
                            Visible::SumUpTo(shift),
                        );
                        product::<F, WIDE, T>(
                            (nk, nq, hd),
                            Left { data: &*ds, row: 1, col: BLOCK },
                            (&q[i0 * ld..], ld),
                            (&mut dqkv_b[dk + j0 * ld..], ld),
                            true,
                            Visible::SumFrom(shift),
                        );
                    }
                }
            }
        }
    }
}
