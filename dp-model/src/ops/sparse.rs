//! A first layer over sparse inputs in CSR: `y = x W + b` with `W` stored `[inputs,
//! outputs]` (a row per input feature, as an embedding table), so that a non-zero reads and
//! writes one contiguous row. Forward and backward cost O(non-zeros x outputs), not O(inputs
//! x outputs): backward writes the gradient rows the batch touches and clears the rows the
//! previous batches left, found in a bitmap, so untouched rows read as zero without a pass
//! over the table. As an embedding bag (no bias), `mean` divides each row's sum by the sum of
//! its values (the bag's size, for id lists stored as counts), as PyTorch's `EmbeddingBag`.

use crate::float::Float;

/// A batch of sparse inputs: row `r`'s non-zeros are at `indices[offsets[r]..offsets[r +
/// 1]]`, with their `values`; every index is below `width`.
#[derive(Clone, Copy, Debug)]
pub struct SparseInput<'a, T> {
    /// `rows + 1` offsets, from 0 to the number of non-zeros.
    pub offsets: &'a [u32],
    /// The positions of the non-zeros, row after row.
    pub indices: &'a [u32],
    /// Their values.
    pub values: &'a [T],
    /// The width of a row: the model's input length.
    pub width: usize,
}

impl<T> SparseInput<'_, T> {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Checks the structure: offsets from 0, not decreasing, within the non-zeros; indices
    /// below `width`. Returns what is wrong.
    pub(crate) fn check(&self) -> Result<(), String> {
        let nnz = self.indices.len();
        if self.values.len() != nnz {
            return Err(format!("{nnz} indices but {} values", self.values.len()));
        }
        match (self.offsets.first(), self.offsets.last()) {
            (Some(0), Some(&last)) if last as usize == nnz => {}
            _ => return Err(format!("offsets must run from 0 to the {nnz} non-zeros")),
        }
        if let Some(r) = self.offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(format!("offset {} decreases", r + 1));
        }
        if let Some(k) = self.indices.iter().position(|&i| i as usize >= self.width) {
            return Err(format!(
                "index {} (non-zero {k}) is not below {}",
                self.indices[k], self.width
            ));
        }
        Ok(())
    }

    /// Row `r`'s indices and values.
    fn row(&self, r: usize) -> (&[u32], &[T]) {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        (&self.indices[a..b], &self.values[a..b])
    }
}

/// What a bag of non-zeros makes of its rows of `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// The values weigh the rows (a sparse linear layer; an embedding bag's `sum`).
    Sum,
    /// The weighted sum divided by the sum of the values (an embedding bag's `mean`).
    Mean,
}

/// Shape of a sparse first layer and where its parameters sit in the flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct SparseLinear {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    pub(crate) bias: bool,
    pub(crate) reduce: Reduce,
    /// Offset of `W` (`inputs * outputs` values), followed by `b` (`outputs` values) if any.
    pub(crate) offset: usize,
}

impl SparseLinear {
    pub(crate) fn param_len(&self) -> usize {
        self.inputs * self.outputs + if self.bias { self.outputs } else { 0 }
    }

    /// The scale of row `r`'s sum.
    fn scale<T: Float>(&self, values: &[T]) -> T {
        match self.reduce {
            Reduce::Sum => T::one(),
            Reduce::Mean => {
                let total = values.iter().fold(T::zero(), |s, &v| s + v);
                if total == T::zero() { T::zero() } else { T::one() / total }
            }
        }
    }

    pub(crate) fn forward<T: Float>(&self, x: &SparseInput<'_, T>, params: &[T], y: &mut [T]) {
        let n = self.outputs;
        let w = &params[self.offset..self.offset + self.inputs * n];
        for (r, out) in y[..x.rows() * n].chunks_exact_mut(n).enumerate() {
            match self.bias {
                true => out.copy_from_slice(&params[self.offset + self.inputs * n..][..n]),
                false => out.fill(T::zero()),
            }
            let (indices, values) = x.row(r);
            let scale = self.scale(values);
            for (&i, &v) in indices.iter().zip(values) {
                let v = v * scale;
                for (o, &wv) in out.iter_mut().zip(&w[i as usize * n..][..n]) {
                    *o += v * wv;
                }
            }
        }
    }

    /// Writes (or adds, with `accumulate`) the gradients of the rows `x` touches and of the
    /// bias; every other row of the weight gradient is zero. `dirty` marks the rows written
    /// since the last overwriting backward (one bit per input).
    pub(crate) fn backward<T: Float>(
        &self,
        x: &SparseInput<'_, T>,
        grads: &mut [T],
        dy: &[T],
        dirty: &mut [u64],
        accumulate: bool,
    ) {
        let n = self.outputs;
        let (dw, db) =
            grads[self.offset..self.offset + self.param_len()].split_at_mut(self.inputs * n);
        if !accumulate {
            for (word_index, word) in dirty.iter_mut().enumerate() {
                let mut bits = std::mem::take(word);
                while bits != 0 {
                    let row = word_index * 64 + bits.trailing_zeros() as usize;
                    dw[row * n..][..n].fill(T::zero());
                    bits &= bits - 1;
                }
            }
            db.fill(T::zero());
        }
        for (r, d) in dy[..x.rows() * n].chunks_exact(n).enumerate() {
            if self.bias {
                for (g, &dv) in db.iter_mut().zip(d) {
                    *g += dv;
                }
            }
            let (indices, values) = x.row(r);
            let scale = self.scale(values);
            for (&i, &v) in indices.iter().zip(values) {
                let i = i as usize;
                dirty[i / 64] |= 1 << (i % 64);
                let v = v * scale;
                for (g, &dv) in dw[i * n..][..n].iter_mut().zip(d) {
                    *g += v * dv;
                }
            }
        }
    }
}
