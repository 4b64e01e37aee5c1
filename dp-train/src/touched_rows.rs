//! The gradients of a sparse first layer's table, all-reduced as the rows some replica
//! touched when few are, instead of the whole table.
//!
//! Every replica knows which rows it wrote (the model's bitmap). The replicas all-gather their
//! bitmaps (a bit per row: 122 KiB for a million rows, per replica) and OR them, so all see
//! the same union and decide alike: when the union's rows are at most a quarter of the
//! table, each packs those rows and the rest of the gradients (the dense layers) into one
//! buffer, all-reduces it and unpacks it; otherwise the whole gradient buffer is all-reduced
//! as for a dense model. At a quarter, packing and unpacking (two copies of the rows) plus the
//! bitmaps cost about what reducing the other three quarters would, on the thread backend,
//! where a reduction is itself a few passes over memory.

use dp_comm::{Communicator, ReduceOp};
use dp_mem::{Pool, PoolBuf, Tag};
use dp_model::Model;

use crate::error::Result;

/// The share of the table's rows up to which only touched rows are reduced.
const MAX_SHARE: usize = 4;

pub(crate) struct TouchedRows {
    /// Every replica's bitmap, rank after rank.
    gathered: PoolBuf<u64>,
    /// Their union.
    union: PoolBuf<u64>,
    /// Packed rows, then the gradients outside the table.
    packed: PoolBuf<f32>,
}

/// How the last reduction went: the table rows packed, or `None` for the whole buffer.
pub(crate) type Reduced = Option<usize>;

impl TouchedRows {
    /// For a model with a sparse first layer reduced among `world` replicas; `None` for any
    /// other model.
    pub(crate) fn new(model: &mut Model<f32>, world: usize, pool: &Pool) -> Result<Option<Self>> {
        let len = model.grads().len();
        let Some(sparse) = model.sparse_grads_mut() else { return Ok(None) };
        let words = sparse.touched.len();
        let rest = len - sparse.table.len();
        let rows = sparse.table.len() / sparse.row_len.max(1);
        Ok(Some(TouchedRows {
            gathered: pool.alloc_zeroed(words * world, Tag::Comm)?,
            union: pool.alloc_zeroed(words, Tag::Comm)?,
            packed: pool.alloc_zeroed(rows / MAX_SHARE * sparse.row_len + rest, Tag::Comm)?,
        }))
    }

    /// Sums `model`'s gradients over `comm`'s replicas (see the module docs).
    pub(crate) fn all_reduce<C: Communicator>(
        &mut self,
        model: &mut Model<f32>,
        comm: &mut C,
    ) -> Result<Reduced> {
        let Some(sparse) = model.sparse_grads_mut() else {
            comm.all_reduce(model.grads_mut(), ReduceOp::Sum)?;
            return Ok(None);
        };
        let words = sparse.touched.len();
        comm.all_gather(sparse.touched, &mut self.gathered)?;
        self.union.fill(0);
        for bitmap in self.gathered.chunks_exact(words) {
            self.union.iter_mut().zip(bitmap).for_each(|(u, &b)| *u |= b);
        }
        let rows: usize = self.union.iter().map(|w| w.count_ones() as usize).sum();
        let (n, table) = (sparse.row_len, sparse.table.clone());
        let len = rows * n + sparse.grads.len() - table.len();
        if len > self.packed.len() {
            comm.all_reduce(sparse.grads, ReduceOp::Sum)?;
            // Rows others touched hold sums now: the next backward must clear them too.
            sparse.touched.copy_from_slice(&self.union);
            return Ok(None);
        }
        let (before, rest) = sparse.grads.split_at_mut(table.start);
        let (table_grads, after) = rest.split_at_mut(table.len());
        let packed = &mut self.packed[..len];
        let mut at = 0;
        for_each_row(&self.union, |row| {
            packed[at..at + n].copy_from_slice(&table_grads[row * n..(row + 1) * n]);
            at += n;
        });
        packed[at..at + before.len()].copy_from_slice(before);
        packed[at + before.len()..].copy_from_slice(after);
        comm.all_reduce(packed, ReduceOp::Sum)?;
        let mut at = 0;
        for_each_row(&self.union, |row| {
            table_grads[row * n..(row + 1) * n].copy_from_slice(&packed[at..at + n]);
            at += n;
        });
        before.copy_from_slice(&packed[at..at + before.len()]);
        after.copy_from_slice(&packed[at + before.len()..]);
        sparse.touched.copy_from_slice(&self.union);
        Ok(Some(rows))
    }
}

/// Calls `f` with every row whose bit is set, in increasing order.
fn for_each_row(bitmap: &[u64], mut f: impl FnMut(usize)) {
    for (w, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            f(w * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dp_comm::LocalGroup;
    use dp_mem::Tracker;
    use dp_model::{LayerSpec, ModelOptions, ModelSpec, SparseInput, StepOptions, Targets};

    use super::*;

    fn model(pool: &Pool) -> Model<f32> {
        let spec = ModelSpec {
            name: "wide".into(),
            input: vec![1000],
            layers: vec![
                LayerSpec::SparseLinear { out: 3 },
                LayerSpec::Relu,
                LayerSpec::Linear { out: 2 },
            ],
        };
        Model::new(&spec, pool, ModelOptions::new(2, 5)).unwrap()
    }

    /// What a replica saw: see [`run`].
    type Seen = (Vec<f32>, Reduced, Vec<f32>, Vec<usize>);

    /// Two replicas, each with a batch touching `rows[rank]`, then a second step on rows 1
    /// and 2 only: the first step's reduced gradients, whether the rows path was taken, the
    /// dense sum for comparison, and the table rows the second backward left non-zero.
    fn run(rows: [Vec<u32>; 2]) -> Vec<Seen> {
        let rows = Arc::new(rows);
        let groups = LocalGroup::new(2).unwrap();
        std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .into_iter()
                .enumerate()
                .map(|(rank, mut comm)| {
                    let rows = Arc::clone(&rows);
                    scope.spawn(move || {
                        let pool = Pool::new(&Tracker::new());
                        let mut m = model(&pool);
                        let mut touched = TouchedRows::new(&mut m, 2, &pool).unwrap().unwrap();
                        let step = |m: &mut Model<f32>, indices: &[u32]| {
                            let offsets = [0, 1, indices.len() as u32];
                            let values = vec![1.0f32; indices.len()];
                            let x = SparseInput {
                                offsets: &offsets,
                                indices,
                                values: &values,
                                width: 1000,
                            };
                            let options = StepOptions::default();
                            m.forward_backward_sparse(x, Targets::Classes(&[0, 1]), &options)
                                .unwrap();
                        };
                        step(&mut m, &rows[rank]);
                        let mut dense = m.grads().to_vec();
                        comm.all_reduce(&mut dense, ReduceOp::Sum).unwrap();
                        let reduced = touched.all_reduce(&mut m, &mut comm).unwrap();
                        let grads = m.grads().to_vec();
                        // The reduction wrote rows the other replica touched: the next backward
                        // must clear them as its own.
                        step(&mut m, &[1, 2]);
                        let table = m.sparse_grads_mut().unwrap().table;
                        let left: Vec<usize> = (0..1000)
                            .filter(|r| {
                                m.grads()[table.start + r * 3..][..3].iter().any(|&g| g != 0.0)
                            })
                            .collect();
                        (grads, reduced, dense, left)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn touched_rows_reduce_to_the_dense_sum_and_are_cleared_after() {
        for (rank_rows, rows_path) in [
            ([vec![3, 70, 999], vec![3, 500]], Some(4)),
            // More than a quarter of the rows: the whole buffer.
            ([(0..200).collect(), (150..400).collect()], None),
        ] {
            for (grads, reduced, dense, left) in run(rank_rows) {
                assert_eq!(reduced, rows_path);
                assert_eq!(grads, dense);
                assert_eq!(left, vec![1, 2]);
            }
        }
    }
}
