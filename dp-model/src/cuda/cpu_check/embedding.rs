//! The token and position embedding's kernels against `Embedding`: forward, the position
//! gradient written and accumulated, and the table gradient's scatter from the segments the
//! host prepares (rows sorted by id), into a zeroed table and added to one a tied head
//! already wrote. Ids repeat within and across samples, and some ids are never read.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::RngCore;

use super::{Grid, Kernels, close, random};
use crate::ops::embedding::Embedding;

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] =
    &["dp_embedding", "dp_embedding_position_grad", "dp_embedding_table_grad"];

/// An embedding to check: vocabulary, width, positions per sample, samples, offset of the
/// layer's parameters. More rows than ids in most, so ids repeat; no more samples than
/// positions.
const CASES: [(usize, usize, usize, usize, usize); 5] =
    [(6, 5, 4, 2, 3), (11, 17, 7, 3, 0), (3, 1, 9, 2, 5), (40, 8, 5, 5, 1), (4, 6, 1, 1, 2)];

/// The first case's ids, as the CPU op's tests have them: id 2 read four times, within and
/// across the two samples, 5 in both, 3 and 4 never. The other cases' are random.
const FIRST_IDS: [f32; 8] = [2.0, 5.0, 2.0, 0.0, 2.0, 1.0, 5.0, 2.0];

/// Every kernel of [`KERNELS`] on `grid`, against the CPU op.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for (n, (vocab, dim, t, batch, offset)) in CASES.into_iter().enumerate() {
        let layer = Embedding { vocab, dim, t, offset, tied: false };
        let rows = batch * t;
        let ids: Vec<f32> = match n {
            0 => FIRST_IDS.to_vec(),
            _ => (0..rows).map(|_| (rng.next_u32() as usize % vocab) as f32).collect(),
        };
        let len = offset + layer.param_len() + 3;
        let params = random(len, rng);
        let dy = random(rows * dim, rng);
        let what = format!("{layer:?}, {batch} samples, ids {ids:?}, grid {grid:?}");
        let gpu = Gpu { k, grid, layer: &layer, batch };
        let mut want = vec![f32::NAN; rows * dim];
        layer.forward(batch, &params, &ids, &mut want);
        close(&gpu.forward(&ids, &params), &want, &format!("y of {what}"));
        let before: Vec<f32> = random(len, rng);
        // Plain (the table zeroed first), then added to a tied head's table gradient, then
        // both accumulated.
        for (add_table, accumulate) in [(false, false), (true, false), (false, true)] {
            let what = format!("add_table {add_table}, accumulate {accumulate} of {what}");
            let mut want = before.clone();
            layer.backward(batch, &mut want, &ids, &dy, add_table, accumulate);
            let mut grads = before.clone();
            gpu.backward(&ids, &dy, &mut grads, add_table || accumulate, accumulate);
            close(&grads, &want, &format!("gradients of {what}"));
        }
    }
}

/// The host's preparation of the table gradient: `(order, starts, segment_ids)`, the rows
/// sorted by id (ties by row, so stably), where each distinct id's run starts in `order` (and
/// a final end), and each run's id.
fn segments(ids: &[f32]) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let id = |r: usize| ids[r] as i64;
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&r| (id(r), r));
    let (mut starts, mut segment_ids) = (Vec::new(), Vec::new());
    for (k, &r) in order.iter().enumerate() {
        if k == 0 || id(r) != id(order[k - 1]) {
            starts.push(k as i64);
            segment_ids.push(id(r));
        }
    }
    starts.push(order.len() as i64);
    (order.iter().map(|&r| r as i64).collect(), starts, segment_ids)
}

/// The kernels of one embedding on one grid.
struct Gpu<'a> {
    k: &'a Kernels,
    grid: Grid,
    layer: &'a Embedding,
    batch: usize,
}

type Forward = unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, i64, i64, i64);
type PositionGrad = unsafe extern "C" fn(*const f32, *mut f32, i64, i64, i64, i32);
type TableGrad =
    unsafe extern "C" fn(*const f32, *const i64, *const i64, *const i64, *mut f32, i64, i64);

impl Gpu<'_> {
    /// `y` for `ids`, the layer's tables at its offset in `params`.
    fn forward(&self, ids: &[f32], params: &[f32]) -> Vec<f32> {
        let kernel = self.k.get::<Forward>("dp_embedding");
        let (l, rows) = (self.layer, ids.len());
        let table = &params[l.offset..l.offset + l.param_len()];
        let positions = &table[l.vocab * l.dim..];
        let mut y = vec![f32::NAN; rows * l.dim];
        let [rows, t, dim] = [rows, l.t, l.dim].map(|v| v as i64);
        let out = y.as_mut_ptr();
        // SAFETY: `ids` holds `rows` ids below `vocab`, `table` `vocab` rows of `dim` and
        // `positions` `t`, `y` `rows`.
        self.k.launch(self.grid, || unsafe {
            kernel(ids.as_ptr(), table.as_ptr(), positions.as_ptr(), out, rows, t, dim)
        });
        y
    }

    /// The gradients of the layer's parameters in `grads`, as the GPU path computes them: the
    /// table zeroed first unless `keep_table`, then the scatter added to it; positions
    /// written, or added with `accumulate`.
    fn backward(&self, ids: &[f32], dy: &[f32], grads: &mut [f32], keep_table: bool, acc: bool) {
        let (l, t) = (self.layer, self.layer.t);
        let (table, positions) =
            grads[l.offset..l.offset + l.param_len()].split_at_mut(l.vocab * l.dim);
        let kernel = self.k.get::<PositionGrad>("dp_embedding_position_grad");
        let [batch, t, dim] = [self.batch, t, l.dim].map(|v| v as i64);
        let out = positions.as_mut_ptr();
        // SAFETY: `dy` holds `batch * t` rows of `dim`, `positions` `t`.
        self.k.launch(self.grid, || unsafe {
            kernel(dy.as_ptr(), out, batch, t, dim, i32::from(acc))
        });
        if !keep_table {
            table.fill(0.0);
        }
        let (order, starts, segment_ids) = segments(ids);
        let kernel = self.k.get::<TableGrad>("dp_embedding_table_grad");
        let (out, count) = (table.as_mut_ptr(), segment_ids.len() as i64);
        // SAFETY: `dy` holds a row of `dim` per id, `order` an index of one per id, `starts`
        // `count + 1` positions in `order`, `segment_ids` `count` ids below `vocab`, `table`
        // `vocab` rows.
        self.k.launch(self.grid, || unsafe {
            let (o, s, i) = (order.as_ptr(), starts.as_ptr(), segment_ids.as_ptr());
            kernel(dy.as_ptr(), o, s, i, out, count, dim)
        });
    }
}
