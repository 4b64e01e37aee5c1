//! A GPT's ends: the token and position embedding that turns ids into its first activations,
//! and the output head that shares the token table (GPT-2's weight tying).
//!
//! Ids arrive as floats in the model's input buffer, like every other input, so the layer
//! reads them as integers and checks them once, when the batch comes in ([`Embedding::check_ids`]),
//! not inside the hot loop, where a bad id would only meet a bounds check.

use crate::float::Float;
use crate::ops::gemm::{Gemm, view, view_mut};

/// Token embedding plus learned position embedding (GPT-2's `wte + wpe`): the model's first
/// layer, reading `t` token ids per sample (as floats: exact integers below `2^24`).
#[derive(Clone, Debug)]
pub(crate) struct Embedding {
    pub(crate) vocab: usize,
    pub(crate) dim: usize,
    /// Positions per sample (the context length).
    pub(crate) t: usize,
    /// Offset of the token table (`vocab` rows of `dim`), followed by the position table (`t`
    /// rows of `dim`).
    pub(crate) offset: usize,
    /// A tied head shares the table, and writes its gradient first (see `backward`).
    pub(crate) tied: bool,
}

/// The output head tied to the token embedding (weight tying, as GPT-2): `logits = x E^T`, no
/// bias. It owns no parameters of its own: it reads and writes the embedding's table.
#[derive(Clone, Debug)]
pub(crate) struct TiedHead {
    pub(crate) vocab: usize,
    pub(crate) dim: usize,
    /// The token table's offset (the [`Embedding`]'s).
    pub(crate) offset: usize,
}

impl Embedding {
    pub(crate) fn param_len(&self) -> usize {
        (self.vocab + self.t) * self.dim
    }

    /// Checks that every id is an integer in `0..vocab` and that the ids make whole samples
    /// of `t`; the error names the sample, position and value.
    pub(crate) fn check_ids<T: Float>(&self, ids: &[T]) -> Result<(), String> {
        if self.t == 0 || !ids.len().is_multiple_of(self.t) {
            return Err(format!("{} token ids are not whole samples of {}", ids.len(), self.t));
        }
        let vocab = self.vocab as f64;
        for (i, &id) in ids.iter().enumerate() {
            let v = id.f64();
            // NaN fails: every comparison with it is false.
            let valid = v >= 0.0 && v < vocab && v.fract() == 0.0;
            if !valid {
                let (sample, position) = (i / self.t, i % self.t);
                return Err(format!(
                    "sample {sample}, position {position}: token id {v} is not an integer in \
                     0..{}",
                    self.vocab
                ));
            }
        }
        Ok(())
    }

    /// The token table row of an id that [`Embedding::check_ids`] passed.
    fn row(&self, id: f64) -> usize {
        debug_assert!(id >= 0.0 && id < self.vocab as f64 && id.fract() == 0.0, "id {id}");
        id as usize
    }

    /// `y[b, p] = table[ids[b, p]] + positions[p]`, `batch * t` rows of `dim`.
    pub(crate) fn forward<T: Float>(&self, batch: usize, params: &[T], ids: &[T], y: &mut [T]) {
        let (d, n) = (self.dim, batch * self.t);
        for (i, (y, &id)) in y[..n * d].chunks_exact_mut(d).zip(&ids[..n]).enumerate() {
            self.forward_row(params, self.row(id.f64()), i % self.t, y);
        }
    }

    /// One row: `y = table[id] + positions[position]`, for an id below `vocab` and a
    /// position below `t`.
    pub(crate) fn forward_row<T: Float>(
        &self,
        params: &[T],
        id: usize,
        position: usize,
        y: &mut [T],
    ) {
        let d = self.dim;
        let (table, positions) =
            params[self.offset..self.offset + self.param_len()].split_at(self.vocab * d);
        let (token, position) = (&table[id * d..(id + 1) * d], &positions[position * d..][..d]);
        for ((y, &e), &p) in y[..d].iter_mut().zip(token).zip(position) {
            *y = e + p;
        }
    }

    /// Position gradients written (or added with `accumulate`), each the sum over the batch.
    /// Table: each row of `dy` added into its id's row; the table gradient is first zeroed
    /// unless `accumulate` or `add_table` (a tied output head already wrote it this step).
    ///
    /// Zeroing the whole table is the price of a scatter; with a tied head it is skipped,
    /// because the head's `dy^T x` writes every row first.
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        grads: &mut [T],
        ids: &[T],
        dy: &[T],
        add_table: bool,
        accumulate: bool,
    ) {
        let (d, n) = (self.dim, batch * self.t);
        let (table, positions) =
            grads[self.offset..self.offset + self.param_len()].split_at_mut(self.vocab * d);
        if !(accumulate || add_table) {
            table.fill(T::zero());
        }
        if !accumulate {
            positions.fill(T::zero());
        }
        for (i, (dy, &id)) in dy[..n * d].chunks_exact(d).zip(&ids[..n]).enumerate() {
            let row = self.row(id.f64());
            for (g, &v) in table[row * d..(row + 1) * d].iter_mut().zip(dy) {
                *g += v;
            }
            let position = (i % self.t) * d;
            for (g, &v) in positions[position..position + d].iter_mut().zip(dy) {
                *g += v;
            }
        }
    }
}

impl TiedHead {
    /// `y = x E^T`: `rows` rows of `vocab` logits from rows of `dim`.
    pub(crate) fn forward<T: Float>(
        &self,
        rows: usize,
        params: &[T],
        x: &[T],
        y: &mut [T],
        gemm: &mut Gemm,
    ) {
        let table = view(&params[self.offset..], self.vocab, self.dim);
        let x = view(x, rows, self.dim);
        gemm.matmul(x, table.t(), T::zero(), &mut view_mut(y, rows, self.vocab));
    }

    /// Table gradient `dy^T x` written (added with `accumulate`); `dx = dy E` overwritten when
    /// given.
    ///
    /// Run before the embedding's backward, which then adds its scatter (`add_table`): the
    /// head's product writes the whole table gradient, so nothing needs zeroing.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        rows: usize,
        params: &[T],
        grads: &mut [T],
        x: &[T],
        dy: &[T],
        dx: Option<&mut [T]>,
        accumulate: bool,
        gemm: &mut Gemm,
    ) {
        let beta = if accumulate { T::one() } else { T::zero() };
        let dy = view(dy, rows, self.vocab);
        let mut table_grad = view_mut(&mut grads[self.offset..], self.vocab, self.dim);
        gemm.matmul(dy.t(), view(x, rows, self.dim), beta, &mut table_grad);
        if let Some(dx) = dx {
            let table = view(&params[self.offset..], self.vocab, self.dim);
            gemm.matmul(dy, table, T::zero(), &mut view_mut(dx, rows, self.dim));
        }
    }
}

#[cfg(test)]
mod tests {
    use dp_mem::{Pool, Tracker};

    use super::*;
    use crate::ops::gemm::{GemmBackend, Precision};

    /// Deterministic values in `[-0.5, 0.5)` from a fixed hash.
    fn values(len: usize, seed: u64) -> Vec<f64> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
            })
            .collect()
    }

    /// Two samples of four positions over a vocabulary of 6, ids repeating within and across
    /// samples, and parameters at an offset.
    fn layer() -> (Embedding, Vec<f64>) {
        let e = Embedding { vocab: 6, dim: 5, t: 4, offset: 3, tied: false };
        (e, vec![2.0, 5.0, 2.0, 0.0, 2.0, 1.0, 5.0, 2.0])
    }

    #[test]
    fn forward_adds_token_and_position_rows() {
        let (e, ids) = layer();
        let params = values(e.offset + e.param_len() + 2, 1);
        let mut y = vec![f64::NAN; ids.len() * e.dim];
        e.forward(2, &params, &ids, &mut y);
        let (table, positions) = (e.offset, e.offset + e.vocab * e.dim);
        for (i, &id) in ids.iter().enumerate() {
            for k in 0..e.dim {
                let want = params[table + id as usize * e.dim + k]
                    + params[positions + (i % 4) * e.dim + k];
                assert_eq!(y[i * e.dim + k], want, "row {i}, column {k}");
            }
        }
    }

    /// Positions get the sum of their rows over the batch; each id's table row gets the sum of
    /// the rows that read it (id 2 is read four times, 3 and 4 never, so theirs are 0). Without
    /// flags both are overwritten; `add_table` keeps what the table gradient held (a tied
    /// head's) and overwrites positions; `accumulate` adds to both.
    #[test]
    fn backward_scatters_and_sums() {
        let (e, ids) = layer();
        let (d, len) = (e.dim, e.offset + e.param_len() + 2);
        let dy = values(ids.len() * d, 2);
        let (table, positions) = (e.offset, e.offset + e.vocab * d);
        let mut fresh = vec![0.0; len];
        for (i, &id) in ids.iter().enumerate() {
            for k in 0..d {
                fresh[table + id as usize * d + k] += dy[i * d + k];
                fresh[positions + (i % 4) * d + k] += dy[i * d + k];
            }
        }
        let before = values(len, 3);
        for (add_table, accumulate) in [(false, false), (true, false), (false, true), (true, true)]
        {
            let mut grads = before.clone();
            e.backward(2, &mut grads, &ids, &dy, add_table, accumulate);
            for i in 0..len {
                let inside = (e.offset..e.offset + e.param_len()).contains(&i);
                let keeps = if i < positions { add_table || accumulate } else { accumulate };
                let want = match (inside, keeps) {
                    (false, _) => before[i],
                    (true, true) => before[i] + fresh[i],
                    (true, false) => fresh[i],
                };
                assert!(
                    (grads[i] - want).abs() < 1e-15,
                    "add_table {add_table}, accumulate {accumulate}: gradient {i} is {}, not {want}",
                    grads[i]
                );
            }
        }
        assert_eq!(&fresh[table + 3 * d..table + 5 * d], &[0.0; 10]);
        assert!(fresh[table + 2 * d..table + 3 * d].iter().all(|&g| g != 0.0));
    }

    /// The embedding's gradients are those of `sum(y * r)` by `f64` central differences.
    #[test]
    fn backward_matches_central_differences() {
        let (e, ids) = layer();
        let params = values(e.offset + e.param_len(), 4);
        let r = values(ids.len() * e.dim, 5);
        let loss = |p: &[f64]| {
            let mut y = vec![0.0; r.len()];
            e.forward(2, p, &ids, &mut y);
            y.iter().zip(&r).map(|(y, r)| y * r).sum::<f64>()
        };
        let mut grads = vec![f64::NAN; params.len()];
        e.backward(2, &mut grads, &ids, &r, false, false);
        let h = 1e-6;
        for i in e.offset..params.len() {
            let (mut up, mut down) = (params.clone(), params.clone());
            up[i] += h;
            down[i] -= h;
            let num = (loss(&up) - loss(&down)) / (2.0 * h);
            assert!((grads[i] - num).abs() < 1e-8, "parameter {i}: {} vs {num}", grads[i]);
        }
    }

    #[test]
    fn check_ids_names_the_bad_id() {
        let (e, mut ids) = layer();
        assert_eq!(e.check_ids(&ids), Ok(()));
        for (bad, shown) in [(1.5, "1.5"), (-1.0, "-1"), (6.0, "6"), (f64::NAN, "NaN")] {
            ids[6] = bad;
            assert_eq!(
                e.check_ids(&ids),
                Err(format!("sample 1, position 2: token id {shown} is not an integer in 0..6")),
            );
            assert!(e.check_ids(&ids.iter().map(|&v| v as f32).collect::<Vec<_>>()).is_err());
        }
        assert_eq!(
            e.check_ids(&[1.0f32; 6]),
            Err("6 token ids are not whole samples of 4".to_string())
        );
        assert_eq!(e.check_ids(&[5.0f32; 8]), Ok(()));
    }

    /// `x E^T` and its gradients against the definition and `f64` central differences of
    /// `sum(y * r)`; `accumulate` adds to the table gradient and `dx` is overwritten.
    #[test]
    fn tied_head_matches_central_differences() {
        let pool = Pool::new(&Tracker::new());
        let mut gemm = Gemm::new(&pool, GemmBackend::current(), Precision::F32).expect("gemm");
        let (vocab, dim, rows, offset) = (7, 5, 3, 2);
        let head = TiedHead { vocab, dim, offset };
        let params = values(offset + vocab * dim + 4, 6);
        let x = values(rows * dim, 7);
        let r = values(rows * vocab, 8);
        let mut y = vec![f64::NAN; rows * vocab];
        head.forward(rows, &params, &x, &mut y, &mut gemm);
        for i in 0..rows {
            for v in 0..vocab {
                let want: f64 =
                    (0..dim).map(|k| x[i * dim + k] * params[offset + v * dim + k]).sum();
                assert!((y[i * vocab + v] - want).abs() < 1e-14, "logit {i}, {v}");
            }
        }
        let mut loss = |p: &[f64], x: &[f64]| {
            let mut y = vec![0.0; r.len()];
            head.forward(rows, p, x, &mut y, &mut gemm);
            y.iter().zip(&r).map(|(y, r)| y * r).sum::<f64>()
        };
        let h = 1e-6;
        let mut numeric_params = vec![0.0; params.len()];
        for i in offset..offset + vocab * dim {
            let (mut up, mut down) = (params.clone(), params.clone());
            up[i] += h;
            down[i] -= h;
            numeric_params[i] = (loss(&up, &x) - loss(&down, &x)) / (2.0 * h);
        }
        let mut numeric_x = vec![0.0; x.len()];
        for i in 0..x.len() {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[i] += h;
            down[i] -= h;
            numeric_x[i] = (loss(&params, &up) - loss(&params, &down)) / (2.0 * h);
        }
        let before = values(params.len(), 9);
        let mut grads = before.clone();
        let mut dx = vec![f64::NAN; x.len()];
        head.backward(rows, &params, &mut grads, &x, &r, Some(&mut dx), false, &mut gemm);
        for i in 0..params.len() {
            let want = if (offset..offset + vocab * dim).contains(&i) {
                numeric_params[i]
            } else {
                before[i]
            };
            assert!((grads[i] - want).abs() < 1e-8, "table gradient {i}: {} vs {want}", grads[i]);
        }
        for i in 0..x.len() {
            assert!((dx[i] - numeric_x[i]).abs() < 1e-8, "input gradient {i}");
        }
        let mut added = grads.clone();
        head.backward(rows, &params, &mut added, &x, &r, None, true, &mut gemm);
        for i in offset..offset + vocab * dim {
            assert!((added[i] - 2.0 * grads[i]).abs() < 1e-12, "accumulated {i}");
        }
    }
}
